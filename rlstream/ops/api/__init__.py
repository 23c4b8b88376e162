"""`rlstream serve`: run control over HTTP and the web view."""
