package server

import "errors"

// ErrServerClosed is returned by Serve and ListenAndServe after Shutdown or
// Close has been called.
var ErrServerClosed = errors.New("server: closed")
