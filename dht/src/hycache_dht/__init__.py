"""HyCache global namespace (the DHT): metadata store engines and a local Redis Cluster."""
