"""The service: the Ray Serve HTTP app, the job manager actor behind it, and its store."""
