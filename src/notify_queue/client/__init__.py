"""Python clients of Notify Queue, for applications (docs/enqueue.md).

- `enqueue(conn, **fields)` / `await enqueue_async(aconn, **fields)`: enqueue inside a
  transaction of a psycopg connection the application owns (the SQL function
  notify_queue_enqueue): nothing is sent unless that transaction commits.
- `Client(base_url, token)` / `AsyncClient(base_url, token)`: the HTTP API, typed
  (`notify_queue.client.types`, checked against the OpenAPI document by the tests).

Light on purpose: psycopg and httpx, no FastAPI, no server code.
"""

from notify_queue.client.enqueue import enqueue, enqueue_async, request_of
from notify_queue.client.http import ApiError, AsyncClient, Client

__all__ = ["ApiError", "AsyncClient", "Client", "enqueue", "enqueue_async", "request_of"]
