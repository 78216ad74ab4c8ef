"""Which worker serves a request: the registry of workers and what they serve (`workers`), cache-aware
routing by prompt prefix (`prefix_routing`, shared with other gateways by `shared_prefixes`) and load
shedding by tier before anything is reserved (`admission`)."""
