"""A serving process of the mount server's pool: one FUSE mount, every reader class of its sites a directory."""
