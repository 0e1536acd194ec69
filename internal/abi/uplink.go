package abi

// UplinkStatus describes the agent's traffic with one other host over the
// tcp path: the connections it opened to the peer (requests out,
// responses in) and those the peer opened to it (requests in, responses
// out), with byte and frame counters that only grow.
type UplinkStatus struct {
	PeerHostID string `json:"peer_host_id"`
	PeerHost   string `json:"peer_host"`
	Address    string `json:"address"` // the peer's PVRDMA address:port
	State      string `json:"state"`   // "up": a connection is open; "idle"; "down": the last attempt failed
	Conns      int    `json:"conns"`   // open connections, both directions
	BytesOut   uint64 `json:"bytes_out"`
	BytesIn    uint64 `json:"bytes_in"`
	FramesOut  uint64 `json:"frames_out"`
	FramesIn   uint64 `json:"frames_in"`
	Dials      uint64 `json:"dials"`   // connections opened to the peer
	Refused    uint64 `json:"refused"` // handshakes refused, either side
	LastError  string `json:"last_error,omitempty"`
}
