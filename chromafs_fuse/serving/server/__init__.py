"""The mount server (chromafs-mountd): its loop, sessions, pool of serving processes and state."""
