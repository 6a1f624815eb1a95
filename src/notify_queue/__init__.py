"""Notify Queue: a notification queue (email, SMS, push) on PostgreSQL, run as a Kubernetes operator."""

__version__ = "0.1.0"
