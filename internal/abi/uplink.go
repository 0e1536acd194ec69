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

// PVRDMAStatus describes the host's end of the tcp path, as its agent
// applies its host record: the tagged PVRDMA address, where the agent
// listens, and the pvrdma firewall rule.
type PVRDMAStatus struct {
	Address   string `json:"address,omitempty"`   // the host record's PVRDMA address:port
	Listening string `json:"listening,omitempty"` // where the agent accepts other hosts' connections
	Firewall  bool   `json:"firewall"`            // the pvrdma firewall rule is on
	Error     string `json:"error,omitempty"`     // why it does not listen on Address
}
