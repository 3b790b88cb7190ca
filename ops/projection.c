/* projection.c — being written */
