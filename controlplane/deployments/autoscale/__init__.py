"""Autoscaling: `policy` decides (pure), `signals` reads, `service` writes, `drain` removes gently,
`metrics` exports `tessera:autoscaler_*`, `cold_start` answers the gateway for a deployment at zero."""
