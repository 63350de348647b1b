"""Tests of the transport layer and the remote agent (real sshd on loopback)."""
