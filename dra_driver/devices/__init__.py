"""GPU discovery: the typed device model, NVLink/PCIe topology, and the NVML and fake backends."""
