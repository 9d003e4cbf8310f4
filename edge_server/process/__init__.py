"""The server process around the app: how it starts, sends and stops.

    shutdown         SIGTERM drains (api/http/draining.py), then uvicorn stops
    send_timeout     uvicorn's HTTP protocol with sends bounded (api/http/send_buffers.py)
                     and --limit-concurrency answered in the API's error shape
    malloc_tuning    glibc's mmap threshold, so freed buffers go back to the system
    systemd_notify   READY=1 / STOPPING=1 / WATCHDOG=1 for a Type=notify unit

Imported by edge_server.cli alone.
"""
