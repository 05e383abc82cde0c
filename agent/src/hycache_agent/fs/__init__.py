"""The file system seam: the FUSE edge, the tiering engine, tiers, the namespace and the local metadata."""
