// The server as its routes (package routing) see it: routeHost is its
// Host and a *session its Session; and routes reloaded with the config.

package proxy

import (
	"context"
	"reflect"

	"go.uber.org/zap"

	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/proxy/routing"
)

// route is a route whose sessions are ours.
type route = routing.Route[*session]

type routeHost struct{ s *Server }

var _ routing.Host[*session] = routeHost{}

// Dial dials a session to addr within limits.max_sessions and
// limits.max_streams.
func (h routeHost) Dial(ctx context.Context, r *route, addr string) (*session, error) {
	stripes := r.Conf().Stripes
	if err := h.s.sessions.reserve(stripes); err != nil {
		return nil, err
	}
	defer h.s.sessions.release(stripes)
	return handshaker(h).dial(ctx, r, addr) // both are the server, seen from two sides
}

func (h routeHost) Room(stripes int) error { return h.s.sessions.room(stripes) }

// Busy counts what is in flight on ss: the engine's transfers on it, the
// pulls it serves, the peer's pushes arriving on it and our small pushes
// waiting for their answers.
func (h routeHost) Busy(ss *session) int {
	return h.s.xfers.running(ss) + h.s.outs.served(ss) + ss.in.count() + ss.out.inlines()
}

// Done, Err, Close and Peer are a session as its route sees it.
func (ss *session) Done() <-chan struct{}       { return ss.done }
func (ss *session) Close(err error)             { ss.close(err) }
func (ss *session) Peer() (node, remote string) { return ss.peerName, ss.remote }

func (ss *session) Err() error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.err
}

// ApplyRoutes makes the configured routes those of cfg (hot reload; see
// routing.Table.Apply). Settings that need a restart are listed in the
// result.
func (s *Server) ApplyRoutes(cfg *config.Config) (added, removed, changed []string, restart []string) {
	added, removed, changed = s.routes.Apply(cfg.Routes)
	restart = restartKeys(s.cfg, cfg)
	s.log.Info("routes reloaded", zap.Strings("added", added), zap.Strings("removed", removed), zap.Strings("changed", changed))
	if len(restart) > 0 {
		s.log.Warn("config changes that take effect only after a restart", zap.Strings("keys", restart))
	}
	return added, removed, changed, restart
}

// restartKeys lists the settings that differ between old and cfg and
// take effect only after a restart.
func restartKeys(old, cfg *config.Config) (restart []string) {
	if old.Listen != cfg.Listen {
		restart = append(restart, "listen")
	}
	if old.ControlSocket != cfg.ControlSocket {
		restart = append(restart, "control_socket")
	}
	if !reflect.DeepEqual(old.Device, cfg.Device) {
		restart = append(restart, "device")
	}
	if old.Staging != cfg.Staging {
		restart = append(restart, "staging")
	}
	if old.Security != cfg.Security {
		restart = append(restart, "security")
	}
	if old.Limits != cfg.Limits {
		restart = append(restart, "limits")
	}
	return restart
}
