"""The rules of Notify Queue, independent of HTTP, Kubernetes and the worker loop."""
