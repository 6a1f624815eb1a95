"""Notify Queue: notifications (email, SMS, push) queued in PostgreSQL, run as an operator."""

__version__ = "0.3.0.dev0"
