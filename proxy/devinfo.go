package proxy

import (
	"github.com/stage-kv/stage/device"
	"github.com/stage-kv/stage/wire"
)

// bareTgider is a device whose engines whitelist the sidecar by the pid
// its driver knows (acl: aclrtDeviceGetBareTgid).
type bareTgider interface {
	BareTgid() (pid int32, source string, err error)
}

// physIDer is a device that knows its physical id.
type physIDer interface {
	PhysicalID() (int32, bool)
}

// deviceInfo answers QueryDevice.
func deviceInfo(dev device.Device) (wire.DeviceInfo, error) {
	info := wire.DeviceInfo{Device: dev.String(), Kind: string(dev.Kind()), Ordinal: dev.Ordinal()}
	if b, ok := dev.(bareTgider); ok {
		pid, src, err := b.BareTgid()
		if err != nil {
			return info, codeErr(wire.CodeDevice, "%s: the sidecar's BareTgid: %v", dev, err)
		}
		info.BareTgid, info.BareTgidFrom = &pid, src
	}
	if p, ok := dev.(physIDer); ok {
		if id, known := p.PhysicalID(); known {
			info.PhysicalID = &id
		}
	}
	return info, nil
}
