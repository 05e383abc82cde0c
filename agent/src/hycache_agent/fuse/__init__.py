"""The FUSE adapter: kernel requests in, vfs calls, replies and errnos out."""
