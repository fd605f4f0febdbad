"""The threaded engine: the shells that send what the protocol builds."""
