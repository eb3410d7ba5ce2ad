/* cuda_graph.cu - CUDA graphs for decode steps (ops->graph_run): one graph per key (the padded
 * batch size and its context bound, model.c), captured lazily on the key's second step, replayed from the third on.
 *
 * Lazily rather than at start-up: only the sizes a workload reaches are captured (a server at
 * low load never pays for the 256-row graph), and the first step of a size runs the ops directly,
 * so lazy kernel-module loading and cuBLAS's first-use set-up happen outside capture. A graph
 * holds no memory of its own: its kernels read and write the model's workspace, whose pointers
 * are fixed at start-up; cuBLAS works in the workspace given with cublasSetWorkspace. Memory per
 * graph is its node list (~15 nodes per layer), a few hundred KiB at most. */
#include "backend/cuda/cuda_backend.h"

#include <stdlib.h>

struct cuda_graph_entry {
  int key;
  int runs;              /* steps seen for this key */
  cudaGraphExec_t exec;  /* NULL until captured */
};

/* The entry of KEY, created on first use; NULL with err_last() set when out of memory. */
static struct cuda_graph_entry *entry(struct cuda_backend *cb, int key) {
  for (int i = 0; i < cb->num_graphs; i++)
    if (cb->graphs[i].key == key)
      return &cb->graphs[i];
  if (cb->num_graphs == cb->graphs_cap) {
    int cap = cb->graphs_cap ? cb->graphs_cap * 2 : 16;
    struct cuda_graph_entry *g =
        (struct cuda_graph_entry *)realloc(cb->graphs, sizeof *g * (size_t)cap);
    if (!g)
      return ERR("out of memory for the CUDA graph table"), (struct cuda_graph_entry *)NULL;
    cb->graphs = g;
    cb->graphs_cap = cap;
  }
  struct cuda_graph_entry *e = &cb->graphs[cb->num_graphs++];
  e->key = key;
  e->runs = 0;
  e->exec = NULL;
  return e;
}

/* Captures RECORD into E's executable graph. On any failure the capture is ended and discarded,
 * the stream is usable again, WHY names the failing step and -1 is returned. */
static int capture(struct cuda_backend *cb, struct cuda_graph_entry *e, int (*record)(void *), void *ctx,
                   const char **why) {
  cudaError_t err = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *why = cudaGetErrorString(err);
    return -1;
  }
  int rc = record(ctx);
  cudaGraph_t graph = NULL;
  err = cudaStreamEndCapture(cb->stream, &graph);
  if (rc == 0 && err == cudaSuccess) {
    err = cudaGraphInstantiate(&e->exec, graph, 0);
    if (err != cudaSuccess)
      e->exec = NULL;
  }
  if (graph)
    cudaGraphDestroy(graph);
  if (rc != 0 || err != cudaSuccess) {
    cudaGetLastError();
    *why = rc != 0 ? "an op failed while being captured" : cudaGetErrorString(err);
    return -1;
  }
  return 0;
}

int cuda_graph_run(struct backend *be, int key, int (*record)(void *ctx), void *ctx) {
  struct cuda_backend *cb = cuda_be(be);
  if (!cb->graphs_on)
    return record(ctx);
  struct cuda_graph_entry *e = entry(cb, key);
  if (!e)
    return -1;
  if (!e->exec && e->runs++ == 0) /* warm-up: run directly once */
    return record(ctx);
  const char *why = NULL;
  if (!e->exec && capture(cb, e, record, ctx, &why) != 0) {
    /* Never fatal: the step runs directly and replay stays off for this backend. */
    log_warn("cuda: capturing the decode graph for batch size %d failed (%s); CUDA graphs are off from "
             "here on", key, why);
    cb->graphs_on = 0;
    return record(ctx);
  }
  CUDA_CHECK(cudaGraphLaunch(e->exec, cb->stream));
  return 0;
}

void cuda_graph_free_all(struct cuda_backend *cb) {
  for (int i = 0; i < cb->num_graphs; i++)
    if (cb->graphs[i].exec)
      cudaGraphExecDestroy(cb->graphs[i].exec);
  free(cb->graphs);
  cb->graphs = NULL;
  cb->num_graphs = cb->graphs_cap = 0;
}
