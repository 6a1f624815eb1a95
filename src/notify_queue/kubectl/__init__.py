"""`kubectl notify`: a kubectl plugin that answers "why is this one late?" and "is it healthy?".

It needs only the user's kubeconfig: it reads the custom resources, and reaches the HTTP API
through the Kubernetes service proxy, with the API token the chart's API Deployment reads, where
the answer is not on the resource (delivery attempts, queue depth, retries). docs/kubectl-notify.md
describes the commands, the RBAC each needs and the decisions behind them.
"""
