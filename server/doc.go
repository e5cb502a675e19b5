// Package server is the Ticketing lock service as a library: a single-node
// server speaking the wire protocol of docs/protocol.md.
//
//	srv, err := server.New(server.Config{DataDir: "/var/lib/ticketing"})
//	if err != nil { ... }
//	go srv.ListenAndServe(":5225")
//	...
//	err = srv.Shutdown(ctx)
//
// (Full documentation in progress; see api_contract.md.)
package server
