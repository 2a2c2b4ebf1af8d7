package registry

// WithStartHook exports withStartHook to the tests.
var WithStartHook = withStartHook
