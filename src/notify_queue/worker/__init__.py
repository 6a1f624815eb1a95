"""The worker role: claim due notifications, deliver them, record results, dispatch webhooks."""
