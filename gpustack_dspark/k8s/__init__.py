"""Kubernetes: the node-label sync (server side) and the manifest checks of deploy/helm/."""
