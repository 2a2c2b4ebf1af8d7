package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

//go:embed assets
var assets embed.FS

// contentSecurityPolicy lets the pages load their own files and talk to
// their own server, and nothing else: no inline script, no other origin,
// no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// file is an embedded file with its ETag.
type file struct {
	body  []byte
	etag  string
	ctype string
}

var (
	filesOnce sync.Once
	files     map[string]file
)

// load reads every embedded file once and hashes it for its ETag.
func load() map[string]file {
	filesOnce.Do(func() {
		files = map[string]file{}
		_ = fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := assets.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			ct := mime.TypeByExtension(path.Ext(p))
			if ct == "" {
				ct = http.DetectContentType(b)
			}
			files[strings.TrimPrefix(p, "assets")] = file{body: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, ctype: ct}
			return nil
		})
	})
	return files
}

// Handler serves the dashboard's files, the page itself at "/": mount it
// under a prefix with http.StripPrefix. Every answer carries a strict
// Content-Security-Policy; files are revalidated by ETag, so a new binary's
// pages are seen at the next load.
func Handler() http.Handler {
	fsys := load()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "" || p == "/" {
			p = "/index.html"
		}
		f, ok := fsys[p]
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if !ok {
			http.Error(w, "no such page of the dashboard: open /ui/", http.StatusNotFound)
			return
		}
		h.Set("Content-Type", f.ctype)
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		http.ServeContent(w, r, p, time.Time{}, bytes.NewReader(f.body))
	})
}
