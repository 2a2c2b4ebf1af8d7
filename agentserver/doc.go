// Package agentserver serves LangGraph's Agent Server API from drover: the
// routes that the official LangGraph SDK Client (`@langchain/langgraph-sdk`
// in TypeScript, `langgraph_sdk` in Python) calls, so that an application
// written against LangGraph Platform or `langgraph dev` points its
// `new Client({ apiUrl })` at drover unchanged.
//
// It serves assistants (create, get, update with versions, delete,
// search, count, versions, set latest, and the graph, schemas and
// subgraphs a runtime registered), threads (create, get, update, delete,
// search, count, copy, state, history) and runs (create, wait, join,
// stream, join stream, get, list, cancel, delete; threadless create, wait
// and stream), stored in etcd under the namespace's agent-server/ keys.
// A run is a task of the namespace's "langgraph" queue (RunsQueue): a
// runtime (the TypeScript client's AgentServerRuntime) registers its
// graphs with PUT /v1/agent-server/graphs/{id}, claims runs as any
// worker, emits their chunks to the task's stream, and records the
// outcome and the thread's state under its claim's token. Every change
// is one etcd transaction that compares what it read, so two servers in
// front of one etcd never lose an update; a bad input is a 400 problem
// naming the field, and nothing is stored. Crons (create, update,
// delete, search, count) are drover schedules whose ticks CronRunner
// turns into runs. Multitask strategies but reject and the store are
// designed in docs/agent-server.md and not served yet.
//
// The routes mount on drover's huma API at the root, as LangGraph serves
// them:
//
//	err := agentserver.Register(api, agentserver.Config{Etcd: cli, Namespace: nsOf})
//
// so they share the API's authentication (a bearer token, or LangGraph's
// x-api-key header carrying one), its namespaces and its problems.
package agentserver
