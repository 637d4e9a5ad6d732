/* The phase trace's marks per record (trace.cuh), shared with the CSV
 * writer (runtime.cu), which includes no trace buffers of its own. */
#ifndef TERN_CUDA_TRACE_MARKS_H
#define TERN_CUDA_TRACE_MARKS_H

#define TRACE_MARKS 12   /* the last: the end */

#endif
