"""A mount at run time: the FUSE adapter, the page tiers, the daemon and the mount server."""
