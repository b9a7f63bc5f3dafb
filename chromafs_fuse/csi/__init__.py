"""`chromafs-csi`: a Kubernetes CSI node plugin that gives each pod's inline volume its session of
the node's mount server (chromafs-mountd). Thin: the gRPC servicer asks the mount server, as
`chromafs-mount` does."""
