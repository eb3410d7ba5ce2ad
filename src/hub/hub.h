/* hub.h - models named by Hugging Face repo id (`org/name`), resolved through the Hugging Face
 * cache exactly as huggingface_hub lays it out, and downloaded from the hub (libcurl) when absent.
 *
 * Cache layout (shared with huggingface_hub, both directions):
 *   <cache>/models--<org>--<name>/refs/<revision>          the commit sha (40 hex, no newline)
 *   <cache>/models--<org>--<name>/blobs/<etag>             file contents; etag = the LFS sha256
 *                                                          or, for a plain git file, its blob id
 *   <cache>/models--<org>--<name>/blobs/<etag>.incomplete  a download in progress (resumed)
 *   <cache>/models--<org>--<name>/snapshots/<sha>/<file>   relative symlink to ../../blobs/<etag>
 *   <cache>/.locks/models--<org>--<name>/<etag>.lock        flock() while a blob is written
 * <cache> = $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub.
 *
 * Hub URLs ($HF_ENDPOINT, default https://huggingface.co):
 *   {endpoint}/api/models/{repo}/revision/{rev}?blobs=true   commit sha + files (size, blob id, lfs)
 *   {endpoint}/{repo}/resolve/{sha}/{file}                   the file (redirects followed)
 * $HF_TOKEN (else $HF_HOME/token) goes out as `Authorization: Bearer`. $HF_HUB_OFFLINE=1: cache
 * only. Network down: the cached snapshot of the revision, when there is one. */
#ifndef PAGODA_HUB_H
#define PAGODA_HUB_H

/* 1 when S has the shape of a repo id, org/name (letters, digits, '-', '_', '.'; no "--" or "..",
 * not ending in a model file suffix such as .gguf); 0 otherwise. */
int hub_is_repo_id(const char *s);

/* Resolves MODEL to a local path (*OUT, malloc'd): an existing local path as it is (FILE, when
 * given, names a file inside that directory); otherwise a repo id, fetched into the cache when
 * needed, at REVISION (NULL: "main"; a branch, tag or commit sha). The files: FILE alone when
 * given (*OUT is that file); else config.json, the tokenizer files and the safetensors weights
 * (the shards of model.safetensors.index.json) when the repo has safetensors (*OUT is the
 * snapshot directory); else the repo's single .gguf (*OUT is that file). Returns a pagoda_status
 * (0 = PAGODA_OK) with err_last() set. */
int hub_resolve(const char *model, const char *revision, const char *file, char **out);

#endif
