"""The service: the HTTP app on Ray Serve replicas, the job manager actor behind it, its store."""
