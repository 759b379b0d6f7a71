"""Ending a run's kernel client: every channel stops, and its sockets' context is destroyed only once no
channel's thread is left to use them (closing a socket under a running thread can crash the whole process)."""

from __future__ import annotations

import threading

import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient

from labkit.run import kernelmanager


def _client(context: zmq.asyncio.Context) -> AsyncKernelClient:
    kc = AsyncKernelClient(context=context)
    kc.load_connection_info({"transport": "tcp", "ip": "127.0.0.1", "hb_port": 9, "shell_port": 9})
    return kc


def _thread_errors(monkeypatch) -> list[str]:
    errors: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(repr(args.exc_value)))
    return errors


def test_a_channel_that_fails_to_stop_does_not_leave_the_heartbeat_running(monkeypatch):
    errors = _thread_errors(monkeypatch)
    context = zmq.asyncio.Context()
    kc = _client(context)
    kc.hb_channel.start()
    shell = kc.shell_channel

    def refuse():
        raise RuntimeError("the loop this socket belonged to is gone")

    shell.stop = refuse
    assert kc.hb_channel.is_alive()
    assert kernelmanager.stop_channels(kc)  # the shell channel raised, the heartbeat still stopped
    assert not kc.hb_channel.is_alive() and errors == []
    context.destroy(linger=0)


def test_a_heartbeat_stopped_as_soon_as_it_starts_ends_without_a_flood_of_sockets(monkeypatch):
    """As for a kernel that dies at its start. Stopped before its loop began, jupyter_client's heartbeat would
    take up its loop anyway and make a socket every turn until zmq refused ('Too many open files')."""
    errors = _thread_errors(monkeypatch)
    for _ in range(20):
        context = zmq.asyncio.Context()
        kc = _client(context)
        kc.hb_channel.start()
        assert kernelmanager.stop_channels(kc)
        context.destroy(linger=0)
    assert errors == []


def test_a_thread_still_running_keeps_the_context_open():
    context = zmq.asyncio.Context()
    kc = _client(context)
    hb = kc.hb_channel
    hb.start()
    hb.stop = lambda: None  # a heartbeat that does not end when asked
    try:
        assert not kernelmanager.stop_channels(kc)
    finally:
        hb._running = False
        hb._exit.set()
        hb.join()
        context.destroy(linger=0)


def test_channels_never_made_are_not_made_to_be_stopped():
    context = zmq.asyncio.Context()
    kc = _client(context)
    assert kernelmanager.stop_channels(kc)
    assert kc._hb_channel is None and kc._shell_channel is None
    assert not any(t.name.startswith("HBChannel") for t in threading.enumerate())
    context.destroy(linger=0)
