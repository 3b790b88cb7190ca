/* sgd.c — being written */
