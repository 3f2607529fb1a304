"""The parameter-server strategies (`--strategy ps-sync|ps-async`): sharding, links, servers, the worker's side."""
