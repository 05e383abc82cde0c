"""The cluster seam: the DHT link (publication, global view), ownership and leases, replicas, rebalance, the peer data service and its client."""
