"""Notify Queue: notifications (email, SMS, push) queued in PostgreSQL, run as an operator."""

__version__ = "0.2.0"
