package sidecar

// SetFenceHooks makes s run before and after around the fence's
// transaction of every change (either may be nil): a test changes the lock
// between the sidecar's check and the fence, or holds a recorded change in
// flight.
func SetFenceHooks(s *Server, before, after func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fenceHooks.before, s.fenceHooks.after = before, after
}
