"""The peer transport, the agent's bottom layer: the authenticated HTTP data service between
agents (server, client, kernel-side bulk bodies).  It knows no engine: what it serves and
where received replicas go are given to it."""
