// Package awsconf loads the AWS SDK's configuration for the AWS sinks
// (sink/kinesissink, sink/sqssink, sink/snssink) and parses the query of
// their URLs, so that all of them connect the same way.
package awsconf

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
)

// Load returns the SDK's usual configuration (credentials from the
// environment, shared files or the instance role; AWS_ENDPOINT_URL_*), in
// region when it is not empty. Its HTTP client is one of its own, so that
// a sink's Close can end its idle connections (CloseIdle). pkg starts the
// error messages.
func Load(ctx context.Context, pkg, region string) (awsCfg aws.Config, err error) {
	var opts []func(*config.LoadOptions) error
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	awsCfg, err = config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return awsCfg, fmt.Errorf("%s: load AWS configuration: %w", pkg, err)
	}
	if awsCfg.Region == "" {
		return awsCfg, fmt.Errorf("%s: no AWS region: add ?region=... to the sink URL or set AWS_REGION", pkg)
	}
	// The transport the SDK configured (proxy, CA bundle, timeouts), in an
	// HTTP client of the sink's own.
	if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
		awsCfg.HTTPClient = &http.Client{Transport: bc.GetTransport()}
	}
	return awsCfg, nil
}

// CloseIdle closes the idle connections of an SDK client's HTTPClient
// when it has a CloseIdleConnections method (Load's has).
func CloseIdle(httpClient any) {
	if c, ok := httpClient.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Query checks the query of a sink URL u against the names it allows and
// returns it; want is the URL form for messages.
func Query(pkg string, u *url.URL, want string, allowed ...string) (url.Values, error) {
	q := u.Query()
	for k, vs := range q {
		known := false
		for _, a := range allowed {
			known = known || k == a
		}
		if !known {
			return nil, fmt.Errorf("%s: sink URL %q: unknown parameter %q; use %s", pkg, u.Redacted(), k, want)
		}
		if len(vs) > 1 {
			return nil, fmt.Errorf("%s: sink URL %q: parameter %q given %d times", pkg, u.Redacted(), k, len(vs))
		}
	}
	return q, nil
}
