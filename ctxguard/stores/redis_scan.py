"""``list_sessions``' SCAN, one page per store operation, that ends.

redis-py's ``scan_iter`` loops until a node answers cursor 0: a proxy or server that
always answers another cursor kept ``ctxguard sessions`` (and ``list_sessions``)
scanning forever. Here each node's walk is a :class:`ScanWalk`: a cursor the node
already answered is a :class:`~ctxguard.errors.StoreError` at once (a Redis cursor
never repeats within one walk), and so is a walk with more pages than the node's
keyspace can take. A Redis SCAN page of ``COUNT`` 1000 visits at least 10,000 buckets or
returns at least 1,000 keys, so a walk needs at most about ``keys / 1000 + buckets /
10000`` pages; :data:`FREE_PAGES` pages are allowed without asking, and past them the
node's ``DBSIZE`` is read and a walk of more than ``2 * DBSIZE + FREE_PAGES`` pages is
refused. Each page is its own operation (its own retries and deadline), so a long walk
of a big keyspace is not cut by one operation's deadline.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ctxguard.errors import StoreError

COUNT = 1000  # SCAN's COUNT hint
FREE_PAGES = 10_000  # pages any walk may take before the node's DBSIZE is asked


class ScanWalk:
    """One node's SCAN walk: the cursor to send next, checked as each page answers."""

    __slots__ = ("allowed", "cursor", "done", "pages", "seen", "where")

    def __init__(self, where: str) -> None:
        self.where = where
        self.cursor = 0
        self.pages = 0
        self.allowed = FREE_PAGES
        self.done = False
        self.seen: set[int] = set()

    def take(self, cursor: int) -> bool:
        """The cursor a page answered; True when the node's DBSIZE must now be read
        (:meth:`allow`) before the next page."""
        self.pages += 1
        if cursor == 0:
            self.done = True
            return False
        if cursor in self.seen:
            raise StoreError(
                f"list failed: {self.where} answered SCAN cursor {cursor} a second time "
                f"(page {self.pages}), so its SCAN never ends: is a proxy in front of Redis "
                "answering SCAN? list the sessions on the Redis server itself"
            )
        self.seen.add(cursor)
        self.cursor = cursor
        return self.pages >= self.allowed

    def allow(self, dbsize: int) -> None:
        """The node holds ``dbsize`` keys: refuse the walk if it is past what they need."""
        allowed = 2 * max(0, dbsize) + FREE_PAGES
        if self.pages >= allowed:
            raise StoreError(
                f"list failed: {self.where} answered SCAN with another cursor after "
                f"{self.pages} pages, more than a keyspace of {dbsize} keys needs, so its "
                "SCAN never ends: is a proxy in front of Redis answering SCAN? list the "
                "sessions on the Redis server itself"
            )
        self.allowed = allowed


def scan_nodes(client: Any) -> list[Any]:
    """The nodes a walk covers: every primary of a cluster, else the one server (None)."""
    if isinstance(client, RedisCluster | AsyncRedisCluster):
        return list(client.get_primaries())
    return [None]


def _page(reply: Any) -> tuple[int, list[bytes]]:
    cursor, keys = reply
    if isinstance(cursor, dict):  # a cluster's, by node name: one node asked
        (cursor,) = cursor.values()
    return int(cursor), list(keys)


def scan_page(client: Any, node: Any, cursor: int, pattern: str) -> tuple[int, list[bytes]]:
    """One SCAN page of ``node`` (None: the server): the next cursor and the keys."""
    kwargs = {} if node is None else {"target_nodes": node}
    return _page(client.scan(cursor, match=pattern, count=COUNT, **kwargs))


async def ascan_page(client: Any, node: Any, cursor: int, pattern: str) -> tuple[int, list[bytes]]:
    kwargs = {} if node is None else {"target_nodes": node}
    return _page(await client.scan(cursor, match=pattern, count=COUNT, **kwargs))


def dbsize(client: Any, node: Any) -> int:
    kwargs = {} if node is None else {"target_nodes": node}
    return int(client.dbsize(**kwargs))


async def adbsize(client: Any, node: Any) -> int:
    kwargs = {} if node is None else {"target_nodes": node}
    return int(await client.dbsize(**kwargs))
