package objects

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// s3Bucket is a Bucket in an S3-compatible object store.
type s3Bucket struct {
	c              *minio.Client
	bucket, prefix string
	endpoint       string
}

// OpenS3 opens s3://BUCKET[/PREFIX][?endpoint=URL&region=R]. The endpoint
// is also read from AWS_ENDPOINT_URL (default https://s3.amazonaws.com);
// the keys come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
// AWS_SESSION_TOKEN), never from the URL, which shows up in process
// lists. It checks that the bucket exists and the keys may read it.
func OpenS3(ctx context.Context, raw string) (Bucket, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.User != nil || u.Fragment != "" {
		return nil, fmt.Errorf("object store %q: want s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION] (keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)", raw)
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" && k != "region" {
			return nil, fmt.Errorf("object store %q: unknown parameter %q (known: endpoint, region)", raw, k)
		}
	}
	endpoint := q.Get("endpoint")
	if endpoint == "" {
		endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	if endpoint == "" {
		endpoint = "https://s3.amazonaws.com"
	}
	e, err := url.Parse(endpoint)
	if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" || (e.Path != "" && e.Path != "/") {
		return nil, fmt.Errorf("object store endpoint %q: want http(s)://HOST[:PORT]", endpoint)
	}
	region := q.Get("region")
	if region == "" {
		region = os.Getenv("AWS_REGION")
	}
	creds := credentials.NewEnvAWS()
	if v, err := creds.Get(); err != nil || v.AccessKeyID == "" {
		return nil, fmt.Errorf("object store %s: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", raw)
	}
	c, err := minio.New(e.Host, &minio.Options{Creds: creds, Secure: e.Scheme == "https", Region: region})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", raw, err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	b := &s3Bucket{c: c, bucket: u.Host, prefix: prefix, endpoint: e.Scheme + "://" + e.Host}
	ok, err := c.BucketExists(ctx, b.bucket)
	if err != nil {
		return nil, fmt.Errorf("object store %s at %s: %w", b, b.endpoint, err)
	}
	if !ok {
		return nil, fmt.Errorf("object store %s at %s: no such bucket (create it first)", b, b.endpoint)
	}
	return b, nil
}

func (b *s3Bucket) String() string { return "s3://" + b.bucket + "/" + b.prefix }

func notFound(err error) bool {
	switch minio.ToErrorResponse(err).Code {
	case minio.NoSuchKey, "NotFound":
		return true
	}
	return false
}

func (b *s3Bucket) Put(ctx context.Context, key string, data []byte) error {
	// Content-MD5 makes the store refuse a body that did not arrive whole.
	_, err := b.c.PutObject(ctx, b.bucket, b.prefix+key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{SendContentMd5: true, DisableMultipart: true, ContentType: "application/octet-stream"})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

func (b *s3Bucket) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	o, err := b.c.GetObject(ctx, b.bucket, b.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		if notFound(err) {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer o.Close()
	data, err := io.ReadAll(io.LimitReader(o, max+1))
	if err != nil {
		if notFound(err) {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("get %s: larger than the %d bytes expected", key, max)
	}
	return data, nil
}

func (b *s3Bucket) Size(ctx context.Context, key string) (int64, error) {
	info, err := b.c.StatObject(ctx, b.bucket, b.prefix+key, minio.StatObjectOptions{})
	if err == nil {
		return info.Size, nil
	}
	if notFound(err) {
		return 0, ErrNotFound
	}
	return 0, fmt.Errorf("stat %s: %w", key, err)
}

func (b *s3Bucket) Delete(ctx context.Context, key string) error {
	if err := b.c.RemoveObject(ctx, b.bucket, b.prefix+key, minio.RemoveObjectOptions{}); err != nil && !notFound(err) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
