package region

// ReleaseConn drops every region the connection conn registered (its
// owner closed): the names are free at once, so a restarted engine may
// register them again while a transfer still holds an old region, which
// lives on unnamed, mapped, until its last reference goes. Same-node peers
// are told to drop the handles (onUnregister). A region an UnregisterWait
// is waiting for leaves the table too; that waiter owns its registration's
// reference and ends with CodeShutdown. It returns the regions dropped, so
// the caller can fail the transfers that hold them.
func (t *Table) ReleaseConn(conn uint64) []*Region {
	t.mu.Lock()
	var rs, waited []*Region
	for name, r := range t.byName {
		if r.Owner.Conn != conn {
			continue
		}
		delete(t.byName, name)
		if r.closing {
			waited = append(waited, r)
		} else {
			rs = append(rs, r)
		}
	}
	t.mu.Unlock()
	for _, r := range rs {
		if t.onUnregister != nil {
			t.onUnregister(r)
		}
		r.Release()
	}
	return append(rs, waited...)
}
