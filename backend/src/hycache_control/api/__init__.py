"""The HTTP layer: routes validate, authorize and translate errors; services do the work."""
