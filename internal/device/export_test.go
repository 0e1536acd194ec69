package device

// SetHarnessPath sets the path the ring harness binds its QPs to.
func SetHarnessPath(f func(q *QP) Path) { harnessPath = f }
