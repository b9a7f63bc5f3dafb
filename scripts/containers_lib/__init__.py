"""The parts of scripts/containers (scripts/container_stack.py, its entry point), one concern
each: common (paths, names, `log`, `sh`), engine (apt, podman's configuration, dockerd), firewall
(its snapshot and restore), images (the base and the builds), stack (the stack, its agents and
checks), compose (docker/compose.yaml as a user runs it)."""
