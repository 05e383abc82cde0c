"""The layer that decides, between the FUSE adapter (:mod:`hycache_agent.fuse`) and the
engine and cluster below: local or remote, take a file over or read it where it is,
lease, HCCache or a whole copy.  Nothing here knows the kernel's protocol."""
