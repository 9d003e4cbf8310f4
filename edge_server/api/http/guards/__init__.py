"""Who may ask and when: API keys, the Host header, CORS, admission, draining, and
one request's hold on the server's capacity."""
