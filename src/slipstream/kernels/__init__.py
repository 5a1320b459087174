"""Device kernels. Each has a plain-torch reference that runs on any device."""
