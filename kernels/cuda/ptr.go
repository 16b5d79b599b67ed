package cuda

// DevicePtr is an address in device memory.
type DevicePtr uint64
