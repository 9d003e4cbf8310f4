"""Images in requests: data URLs decoded and checked, http(s) URLs fetched behind an
address filter."""
