"""ResourceSlices: build them from the device model, validate them, publish them."""
