"""The node health agents' API: heartbeats and the signals each agent sees on its node.

The agents' hot path (1,280 nodes reporting every few seconds). A node's record is
service/nodes/'s; what a signal means and what follows from it, service/recovery/'s."""
