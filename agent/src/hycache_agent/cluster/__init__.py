"""The cluster seam: the DHT link (publication, node registry, global view), ownership and leases, replicas, rebalance, invalidations."""
