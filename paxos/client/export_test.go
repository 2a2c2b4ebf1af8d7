package client

// NextEndpoint is the endpoint c sends its next request to.
func NextEndpoint(c *Client) string { return c.endpoints[c.next.Load()] }
