"""A site as a reader sees it, shared by a mount (serving/) and the front ends (frontends/, cli/):
its tree loaded and pruned per reader, its pages' tiers, the reader's view without a mount."""
